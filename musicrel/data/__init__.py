"""Data the model learns from: the prepared-folder format that `musicrel prepare` writes (training/prepare.py)
and that training, the n-gram baseline and the evaluation read."""
