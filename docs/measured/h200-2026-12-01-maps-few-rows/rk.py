import torch, sys
from moe_build import kernels as K
E, Kk, T = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
logits = torch.randn(T, E, device="cuda")
for _ in range(3):
    K.routing_prologue_fused_routing(logits, Kk, K.Routing.SOFTMAX_TOPK, True)
    ids, w = K.routing(logits, Kk, K.Routing.SOFTMAX_TOPK, True)
    K.routing_prologue_fused(ids, E)
torch.cuda.synchronize()
