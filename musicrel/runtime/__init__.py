"""How the library runs on the machine at hand: the torch thread policy (`threads.py`)."""
