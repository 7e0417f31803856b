"""A torch.compile'd Hugging Face causal language model (the Llama architecture), built from a
config with random weights (nothing is downloaded): a few training steps — forward, the
language-model loss, backward — in bfloat16 on one GPU. A program whose kernels nobody on the
project wrote, for ``kpair optimize``:

    kpair optimize -o REL --top 12 --kernel-filter '^triton_' -- \\
        python benchmarks/programs/hf_causal_lm.py
"""

from __future__ import annotations

import argparse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=args.seq)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    step = torch.compile(model)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    for _ in range(args.steps):
        loss = step(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
