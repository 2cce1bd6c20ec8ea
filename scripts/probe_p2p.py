"""Probe of point-to-point send/recv on CPU (mccl), the prerequisite of pipeline parallel; run under msrun, 2 ranks.

    PATH=.venv/bin:$PATH msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8300 \
        --log_dir=/tmp/p2p --join=True scripts/probe_p2p.py {pynative|graph} {ops|comm_func|mint}

Prints one ``PROBE <mode> <api> rank<r>: OK|FAIL ...`` line per rank into the worker logs. Results with MindSpore
2.10.0 are in README "Pipeline parallel on CPU": every API fails, so pipeline parallel is left out of the plans.
"""
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

ms.set_device("CPU")
mode = sys.argv[1]
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
from mindspore.communication import get_rank, init  # noqa: E402 - after the context settings

init()
r = get_rank()
x = Tensor(np.full((2, 3), r + 1.0, np.float32))

def attempt(name, fn):
    try:
        out = fn()
        print(f"PROBE {mode} {name} rank{r}: OK {out}", flush=True)
    except Exception as e:
        detail = " | ".join(ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("-"))
        print(f"PROBE {mode} {name} rank{r}: FAIL {type(e).__name__}: {detail[:700]}", flush=True)

class SendNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.send = ops.Send(sr_tag=0, dest_rank=1, group="mccl_world_group")
    def construct(self, x):
        return self.send(x)
class RecvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.recv = ops.Receive(sr_tag=0, src_rank=0, shape=[2, 3], dtype=ms.float32, group="mccl_world_group")
    def construct(self):
        return self.recv()

def ops_send_recv():
    if r == 0:
        return SendNet()(x)
    return RecvNet()().asnumpy()

def comm_func():
    from mindspore.communication.comm_func import recv, send
    if r == 0:
        return send(x, 1)
    return recv(ops.zeros((2, 3), ms.float32), 0).asnumpy()

def mint_dist():
    from mindspore.mint.distributed import recv, send
    if r == 0:
        return send(x, 1, group="mccl_world_group")
    t = ops.zeros((2, 3), ms.float32)
    recv(t, 0, group="mccl_world_group")
    return t.asnumpy()

which = sys.argv[2]
attempt(which, {"ops": ops_send_recv, "comm_func": comm_func, "mint": mint_dist}[which])
