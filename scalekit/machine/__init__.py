"""The machine a run is on: its hardware (`hardware.detect`), the memory a process may use (`memory_limit`, cgroups
included), the C++ compiler torch.compile's CPU backend runs (`cxx`), and `scalekit doctor`, which says all of it.
Read without side effects: no CUDA context is made to ask."""
