"""A torch.compile'd torchvision model (ResNet-18 by default) with random weights: a few
training steps — forward, cross-entropy, backward — with channels-last activations under
bfloat16 autocast on one GPU. A program whose kernels nobody on the project wrote, for
``kpair optimize``:

    kpair optimize -o REL --top 12 --kernel-filter '^triton_' -- \\
        python benchmarks/programs/torchvision_model.py
"""

from __future__ import annotations

import argparse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None).cuda()
    model = model.to(memory_format=torch.channels_last).train()
    step = torch.compile(model)
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda").to(
        memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    for _ in range(args.steps):
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(step(x), y)
        loss.backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
