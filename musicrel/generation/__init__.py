"""From a motif to new tokens and back: sampling parameters, decoding, grammar, controls, primer, streaming
notes, the continuous-batching decoder."""
