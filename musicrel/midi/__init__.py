"""Which files count as MIDI, the hostile-input scan of their bytes, and the codec (MIDI <-> event tokens)."""
