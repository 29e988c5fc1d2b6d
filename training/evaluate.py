"""`musicrel evaluate`: NLL (nats/token), perplexity and accuracy of a model folder on a prepared split,
over non-overlapping windows of the model's context (each token is predicted once, from at most L-1 tokens of
context: the first tokens of each window see little context, so this is a slight overestimate of the NLL)."""

from __future__ import annotations

import math

import numpy as np

from musicrel.errors import ConfigError


def score_stream(
    model,
    stream: np.ndarray,
    pad_id: int,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_windows: int | None = None,
) -> dict:
    """Sum of NLL, correct predictions and token count over non-overlapping windows of `stream`."""
    import torch

    from training.data import WindowDataset

    seq_len = seq_len or model.cfg.max_seq_len
    if not 1 <= seq_len <= model.cfg.max_seq_len:
        raise ConfigError(
            f"seq_len must be in 1..{model.cfg.max_seq_len} (the model's max_seq_len), got {seq_len}"
        )
    ds = WindowDataset(stream, seq_len, pad_id, limit=max_windows)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size)
    device = next(model.parameters()).device
    nll = correct = count = 0.0
    with torch.inference_mode():
        for batch in loader:
            x, y = batch["inputs"].to(device), batch["targets"].to(device)
            logits = model(x).float()  # (B, T, V)
            flat, target = logits.reshape(-1, logits.size(-1)), y.reshape(-1)
            mask = target != -100
            nll += float(torch.nn.functional.cross_entropy(flat, target, ignore_index=-100, reduction="sum"))
            correct += float(((flat.argmax(-1) == target) & mask).sum())
            count += float(mask.sum())
    return {"windows": len(ds), "tokens": int(count), "nll_sum": nll, "correct": int(correct)}


def evaluate(
    checkpoint,
    data,
    split: str = "test",
    batch_size: int = 8,
    max_windows: int | None = None,
    seq_len: int | None = None,
    weights: str = "float32",
) -> dict:
    from musicrel.data.prepared import load_manifest, load_split, source_ranges
    from musicrel.midi.codec import CodecConfig, EventCodec, id_map
    from musicrel.model.checkpoint import load_codec, load_model

    model, codec = load_model(checkpoint, weights=weights), load_codec(checkpoint)
    manifest = load_manifest(data)
    # fields added since: their defaults; infill markers add tokens (and move a codec's INSTRUMENT ids up:
    # `id_map`), so do INSTRUMENT tokens for a folder prepared without them (a stream without one is the
    # piano's to a model with instruments, as decoding reads it): its piano NLL is on the very tokens a piano
    # model is scored on
    same = {"infill": codec.config.infill}
    if not manifest["codec"].get("instruments"):
        same["instruments"] = codec.config.instruments
    if CodecConfig.from_dict({**manifest["codec"], **same}) != codec.config:
        raise ConfigError(
            f"{data} was prepared with other codec settings than the model's; "
            "re-run `musicrel prepare` with the model's codec",
            code="codec_mismatch",
        )
    stream, _ = load_split(data, split)
    ids = id_map(EventCodec(CodecConfig.from_dict(manifest["codec"])), codec)
    if ids is not None:
        stream = ids[stream]
    info = manifest["splits"][split]
    # each source is scored on its own part of the stream (windows never mix two sources); the whole split's
    # figures pool them. A single-source (or format-1) folder is one part.
    parts = source_ranges(manifest, split)
    per_source = {}
    for name, (a, b) in (parts or {"all": (0, stream.size)}).items():
        s = score_stream(
            model, stream[a:b], codec.pad_id, seq_len=seq_len, batch_size=batch_size, max_windows=max_windows
        )
        pieces = info["sources"][name]["pieces"] if parts else info["pieces"]
        per_source[name] = {**_figures(s), "pieces": pieces}
    total = {k: sum(r[k] for r in per_source.values()) for k in ("windows", "tokens", "nll_sum", "correct")}
    if total["tokens"] == 0:
        raise ConfigError(f"split {split!r} of {data} has no tokens to score", code="no_data")
    result = {
        "split": split,
        "weights": weights,
        "pieces": info["pieces"],
        **_figures(total),
        "uniform_nll": math.log(codec.vocab_size),
    }
    if parts:
        result["sources"] = per_source
    return result


def _figures(s: dict) -> dict:
    tokens = max(1, s["tokens"])
    nll = s["nll_sum"] / tokens
    return {
        "windows": s["windows"],
        "tokens": s["tokens"],
        "nll_sum": s["nll_sum"],
        "correct": s["correct"],
        "nll": nll,
        "perplexity": math.exp(nll),
        "accuracy": s["correct"] / tokens,
    }


def format_nll_table(r: dict) -> str:
    rows = [
        ("split", r["split"]),
        ("weights", r["weights"]),
        ("pieces", r["pieces"]),
        ("windows", r["windows"]),
        ("tokens", r["tokens"]),
        ("NLL (nats/token)", f"{r['nll']:.4f}"),
        ("perplexity", f"{r['perplexity']:.3f}"),
        ("accuracy", f"{r['accuracy']:.4f}"),
        ("uniform NLL ln(V)", f"{r['uniform_nll']:.4f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if "sources" in r:
        lines.append("")
        lines.append(f"{'source':<20s} {'pieces':>7s} {'tokens':>10s} {'NLL':>7s} {'accuracy':>8s}")
        for name, x in r["sources"].items():
            lines.append(
                f"{name:<20s} {x['pieces']:>7d} {x['tokens']:>10d} {x['nll']:>7.4f} {x['accuracy']:>8.4f}"
            )
    return "\n".join(lines)
