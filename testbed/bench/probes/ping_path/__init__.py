"""One ping's legs: sitecustomize.py records B's frames, split and cpu_states read them."""
