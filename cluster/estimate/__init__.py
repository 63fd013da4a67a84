"""How long a run will take: the wall-time model, the calls' time and the machine's load."""
