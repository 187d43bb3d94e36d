"""Scale-out: one run over several processes (`accelerate launch` / `torchrun`).

    processes.py   what the loop asks of the processes: rank, world size, the few collectives of objects, and the
                   seam (`wrap`): one process trains with logprobs.LogprobForward as it is
    ddp_fsdp.py    torch's engines, DistributedDataParallel and FSDP2, imported only when W > 1
"""
