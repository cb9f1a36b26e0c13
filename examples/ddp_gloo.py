"""A PyTorch DDP job over gloo (CPU): each rank trains a tiny model on its own data for a few
steps; DDP averages the gradients, so every rank must end with identical parameters. Prints
`ddp rank R of N params <digest>`. Run it under `atlasboost run --framework pytorch`: torch's
env:// rendezvous reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from atlasboost, and gloo
binds the interface GLOO_SOCKET_IFNAME names (atlasboost sets it to the host's server_id
interface unless you did)."""

import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo", init_method="env://")
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(1000 + rank)
for _ in range(5):
    x = torch.randn(16, 8, generator=gen)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
print(f"ddp rank {rank} of {size} params {digest} gloo {os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
dist.destroy_process_group()
