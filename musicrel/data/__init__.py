"""Data the model learns from: the prepared-folder format that `musicrel prepare` writes (training/prepare.py)
and that training, the n-gram baseline and the evaluation read; the versions of one composition found from
the notes (compositions.py), by which prepare splits and the evaluation's classifier folds."""
