"""Where scalekit.launch relies on torch behaviour that torch does not document, each named once, with why.

Everything else the launch uses is torch's public elastic API: start_processes, PContext.wait / pids /
close, LogsSpecs and LogsDest, SignalException, TCPStore.  tests/launch/test_launch_torch_hooks.py checks every
entry below against the installed torch and names the entry and the torch version when one stops holding.
"""

USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
FORKS_IN_CALLER = "start_processes forks in the calling thread"

PRIVATE_TORCH_HOOKS = {
    USE_AGENT_STORE: (
        "set to 'True' in every rank's environment: torch.distributed's env:// rendezvous (and the TCPStore it "
        "makes) then connects rank 0 to the store the launcher hosts instead of binding MASTER_PORT itself.  The launcher binds the port "
        "(the operating system's choice, held from the start), so two launches never race for one; torchrun's "
        "agent sets the same variable for the same reason, but torch documents it only in its source."),
    SIGNALS_TO_HANDLE: (
        "set to '' while ranks start: PContext.start then installs no signal handler of its own (its handlers "
        "raise SignalException at any moment, even half-way through starting the ranks, where scalekit's own "
        "hold a signal until every rank is known).  The variable is what torchrun's --signals-to-handle sets; "
        "that an empty list installs nothing is not documented."),
    FORKS_IN_CALLER: (
        "start_processes(start_method='fork') forks every rank from the thread that calls it.  Each rank asks the "
        "kernel to kill it when the thread that forked it ends (prctl's PR_SET_PDEATHSIG follows that thread, "
        "not the process: rank.end_with_launcher), so that a launcher killed outright leaves no rank behind; the "
        "agent's thread runs the whole launch.  Were torch to fork from a helper thread that ends, every rank "
        "would be killed as it starts.  torch's own worker wrapper assumes the same, but torch does not document it."),
}
