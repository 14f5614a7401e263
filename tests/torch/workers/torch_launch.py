"""Worker for tests/torch/test_torch_work.py: ``init_process_group("commlib")`` as a plain script would call
it, under whatever launched it (mpiexec, torchrun), and one collective of each kind; prints one line per rank.

    python torch_launch.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("commlib")  # known without importing commlib: torch's backend entry point
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
assert torch.all(t == size * (size + 1) / 2), t
outs = [torch.empty(2) for _ in range(size)]
dist.all_gather(outs, torch.full((2,), float(rank)))
assert [o[0].item() for o in outs] == list(range(size)), outs
box = [{"from": 0} if rank == 0 else None]
dist.broadcast_object_list(box, src=0)
assert box[0] == {"from": 0}
print(f"launched rank {rank} of {size} on {dist.get_backend()}", flush=True)
dist.destroy_process_group()
