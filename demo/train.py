#!/usr/bin/env python3
"""Trains Conveyor's demo model: a small Llama that writes King James English.

One deterministic pipeline, run from the repository root in a venv with torch, tokenizers
and safetensors (demo/README.md has the exact command):
  1. text: the King James Bible, dumped verse by verse by `bible` (Debian packages
     bible-kjv and bible-kjv-text); one document per chapter, verses one per line. Every
     20th chapter is held out for evaluation and never trained on;
  2. tokenizer: byte-level BPE trained with HF `tokenizers` on the training chapters, with
     <s> (BOS, added by the post-processor) and </s> (EOS);
  3. model: a Llama (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied
     embeddings) written out here with the module and tensor names of HF's
     LlamaForCausalLM, trained with AdamW on random windows of the training stream;
  4. evaluation: held-out perplexity per token of the weights as saved (rounded to bf16),
     next to a unigram model's on the same tokens, and on held-out passages given twice
     (the second copy's perplexity says whether the model copies from its context);
  5. output: config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
     (with a chat template) and generation_config.json, as Conveyor loads them.
"""

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch import nn

from kjv import read_chapters, split_held_out

BOS, EOS = "<s>", "</s>"

# The model is not instruction-tuned: the template lays a conversation out as text the model
# knows, one message per line (as verses are), and the reply continues it. Only the
# assistant's turns end with </s>, as a finished reply would. The newline is an expression
# because chat templates render with trim_blocks, which drops a newline after a tag.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['content'] | trim }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% if not loop.last or add_generation_prompt %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo/model", help="output directory (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=704, help="MLP intermediate size")
    p.add_argument("--context", type=int, default=512,
                   help="training window and max_position_embeddings")
    p.add_argument("--batch", type=int, default=4,
                   help="windows of text per step (0: copy windows only, --copy-batch)")
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--init-from", default=None,
                   help="start from this model directory (its config, weights and tokenizer) "
                        "instead of a new model: continued training")
    p.add_argument("--tokenizer-from", default=None,
                   help="use this model directory's tokenizer.json instead of training one "
                        "(a draft model for another model needs its vocabulary)")
    p.add_argument("--copy-batch", type=int, default=0,
                   help="windows per step, besides --batch, that repeat a passage "
                        "(copy_window): teach the model to continue a passage its context "
                        "already holds")
    p.add_argument("--copy-context", type=int, default=192, help="tokens of a copy window")
    p.add_argument("--copy-warmup", type=int, default=150,
                   help="first steps whose copy windows are random tokens with a run of them "
                        "repeated at a random distance (random_copy_window); copy_window's "
                        "layout after them")
    return p.parse_args()


# ---------------------------------------------------------------- text and tokenizer

def train_tokenizer(texts, vocab_size):
    """Byte-level BPE (GPT-2 style: no normalizer, GPT-2 split regex, ByteLevel decoder),
    so decode(encode(text)) == text for any UTF-8 text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    # Encoding "with special tokens" (what the server does for a text prompt) adds BOS.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def copy_window(stream, length, vocab_size, gen):
    """`length` + 1 tokens in which a passage of the training stream occurs twice, with
    other text between and before: [text][passage][other text][passage][...]. The loss on
    the second copy teaches the model to find what followed the same words earlier in its
    context and continue it (what an induction head does), the skill that quoting,
    editing and summarising prompts ask of it."""
    def span(n):
        o = int(torch.randint(0, len(stream) - n - 1, (1,), generator=gen))
        return stream[o:o + n]
    n = int(torch.randint(16, length // 3, (1,), generator=gen))
    # Half the passages are random tokens: nothing but the earlier copy predicts them, so
    # they teach copying itself; the others, text, teach where a passage ends.
    passage = (span(n) if torch.rand(1, generator=gen) < 0.5
               else torch.randint(2, vocab_size, (n,), generator=gen))
    lead = span(int(torch.randint(0, length // 6, (1,), generator=gen)))
    gap = span(int(torch.randint(1, length // 6, (1,), generator=gen)))
    parts = [lead, passage, gap, passage]
    used = sum(len(x) for x in parts)
    parts.append(span(length + 1 - used))
    return torch.cat(parts), second_copy_mask(length, used - n, n)


def random_copy_window(length, vocab_size, gen):
    """`length` + 1 random tokens in which a run of them recurs once, at a random distance:
    only finding the earlier occurrence by content predicts the second (a fixed offset
    does not: it would teach a head to look a set number of tokens back)."""
    window = torch.randint(2, vocab_size, (length + 1,), generator=gen)
    n = int(torch.randint(8, length // 3, (1,), generator=gen))
    first = int(torch.randint(0, length // 3, (1,), generator=gen))
    second = int(torch.randint(first + n, length + 1 - n, (1,), generator=gen))
    window[second:second + n] = window[first:first + n]
    return window, second_copy_mask(length, second, n)


def second_copy_mask(length, second, n):
    """Which of a window's `length` targets lie in the second copy of a passage starting at
    token `second`: past its first token, only the earlier copy predicts them. Training on
    these alone keeps the signal that teaches copying from drowning in the loss of tokens
    nothing predicts (random ones) or that plain text already teaches."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[second:second + n - 1] = True  # target t is token t + 1
    return mask


def token_stream(tok, texts):
    """All texts as one id stream, each framed as <s> text </s>."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids += [bos] + enc.ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, hd = cfg["hidden_size"], cfg["head_dim"]
        self.heads, self.kv_heads, self.head_dim = (cfg["num_attention_heads"],
                                                    cfg["num_key_value_heads"], hd)
        self.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # Grouped-query attention as HF's repeat_kv: kv head j serves query heads
        # j*rep .. (j+1)*rep-1.
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = Mlp(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LlamaForCausalLM with tied embeddings; state_dict() keys are HF's tensor names."""

    def __init__(self, cfg):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(DecoderLayer(cfg)
                                          for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        hd = cfg["head_dim"]
        inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
        angles = torch.outer(torch.arange(cfg["max_position_embeddings"]).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        # GPT-2 style init: N(0, 0.02), the projections into the residual stream scaled
        # down by sqrt(2 * layers) so the stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std /= math.sqrt(2 * cfg["num_hidden_layers"])
                nn.init.normal_(p, std=std)

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x) @ self.model.embed_tokens.weight.T


def make_config(args, tok):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": args.hidden,
        "intermediate_size": args.ffn,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "max_position_embeddings": args.context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }


# ---------------------------------------------------------------- training and evaluation

def train(model, stream, args, gen, held_stream):
    vocab_size = model.model.embed_tokens.weight.shape[0]
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step):  # Linear warm-up, then cosine decay to a tenth of the peak.
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        done = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))

    start, smoothed = time.time(), None
    for step in range(args.steps):
        loss = torch.zeros(())
        if args.batch > 0:
            offsets = torch.randint(0, len(stream) - args.context - 1, (args.batch,),
                                    generator=gen)
            window = torch.stack([stream[o:o + args.context + 1] for o in offsets])
            logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        if args.copy_batch > 0:
            # Short windows, many of them: copying is learnt from the number of repeats
            # seen (a few hundred steps of these), not from their length.
            make = ((lambda: random_copy_window(args.copy_context, vocab_size, gen))
                    if step < args.copy_warmup
                    else (lambda: copy_window(stream, args.copy_context, vocab_size, gen)))
            copies, masks = zip(*(make() for _ in range(args.copy_batch)))
            copies, masks = torch.stack(copies), torch.stack(masks)
            logits = model(copies[:, :-1])
            loss = loss + F.cross_entropy(logits[masks], copies[:, 1:][masks])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            copying = ""
            if args.copy_batch > 0 and (step + 1) % 100 == 0:
                model.eval()
                copying = (f"  repeated passages "
                           f"{math.exp(copy_nll(model, held_stream, args.context)):.2f}")
                model.train()
            print(f"step {step + 1}/{args.steps}  loss {smoothed:.3f}  "
                  f"lr {lr_at(step):.2e}  {time.time() - start:.0f} s{copying}", flush=True)


@torch.no_grad()
def held_out_nll(model, stream, context):
    """Mean next-token NLL over the stream, cut into consecutive windows of `context`
    tokens; each window's tokens are predicted from the window's earlier ones."""
    total, count = 0.0, 0
    for begin in range(0, len(stream) - 1, context):
        window = stream[begin:begin + context + 1].unsqueeze(0)
        logits = model(window[:, :-1])
        total += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        count += window.shape[1] - 1
    return total / count


@torch.no_grad()
def copy_nll(model, stream, context, count=64):
    """Mean NLL of the second copy of a held-out passage laid out as [passage][64 tokens
    of other text][passage] (a fixed seed): low when the model continues what its context
    already said."""
    gen = torch.Generator().manual_seed(1234)
    total, tokens = 0.0, 0
    for _ in range(count):
        n = int(torch.randint(24, context // 3, (1,), generator=gen))
        o = int(torch.randint(0, len(stream) - n - 1, (1,), generator=gen))
        g = int(torch.randint(0, len(stream) - 65, (1,), generator=gen))
        passage, gap = stream[o:o + n], stream[g:g + 64]
        window = torch.cat([passage, gap, passage]).unsqueeze(0)
        logits = model(window[:, :-1])[0, -(n - 1):]
        total += F.cross_entropy(logits, window[0, -(n - 1):], reduction="sum").item()
        tokens += n - 1
    return total / tokens


def unigram_nll(train_stream, held_stream, vocab_size):
    """The same targets as held_out_nll under add-one-smoothed training token frequencies."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1
    log_p = (counts / counts.sum()).log()
    return -log_p[held_stream[1:]].mean().item()


@torch.no_grad()
def sample(model, tok, prompt, n, gen):
    """A temperature-0.8 continuation of `prompt`, to eyeball the trained model in the log."""
    ids = torch.tensor([tok.encode(prompt).ids])
    for _ in range(n):
        probs = F.softmax(model(ids[:, -model.cos.shape[0]:])[0, -1] / 0.8, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen).view(1, 1)], dim=1)
    return tok.decode(ids[0].tolist())


def tokenizer_config(cfg):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }


def write_model_dir(out, cfg, model, tok):
    os.makedirs(out, exist_ok=True)

    def write_json(name, obj):
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")

    write_json("config.json", cfg)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    tok.save(os.path.join(out, "tokenizer.json"))
    write_json("tokenizer_config.json", tokenizer_config(cfg))
    # Sampling settings that read well for this model (also used by scripts/demo.sh).
    write_json("generation_config.json", {
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
    })


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    began = time.time()

    chapters = read_chapters()
    kept, held = split_held_out(chapters)
    tok_dir = args.init_from or args.tokenizer_from
    tok = (Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")) if tok_dir
           else train_tokenizer(kept, args.vocab))
    train_stream, held_stream = token_stream(tok, kept), token_stream(tok, held)
    print(f"{len(kept)} training chapters ({len(train_stream)} tokens), {len(held)} held out "
          f"({len(held_stream)} tokens); vocabulary {tok.get_vocab_size()}", flush=True)

    if args.init_from:
        with open(os.path.join(args.init_from, "config.json")) as f:
            cfg = json.load(f)
        model = Llama(cfg)
        weights = load_file(os.path.join(args.init_from, "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in weights.items()})
        model.eval()
        print(f"starting from {args.init_from}: held-out perplexity "
              f"{math.exp(held_out_nll(model, held_stream, cfg['max_position_embeddings'])):.2f}"
              f", repeated passages {math.exp(copy_nll(model, held_stream, cfg['max_position_embeddings'])):.2f}",
              flush=True)
        model.train()
    else:
        cfg = make_config(args, tok)
        model = Llama(cfg)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params} parameters; {args.steps} steps of {args.batch} x {args.context} "
          f"tokens ({args.steps * args.batch * args.context / len(train_stream):.2f} epochs)",
          flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    train(model, train_stream, args, gen, held_stream)

    # Evaluate the weights as they will be served: rounded to bf16, computed in fp32.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    context = cfg["max_position_embeddings"]
    ppl = math.exp(held_out_nll(model, held_stream, context))
    uni = math.exp(unigram_nll(train_stream, held_stream, cfg["vocab_size"]))
    print(f"held-out perplexity {ppl:.2f}; unigram baseline {uni:.2f} ({uni / ppl:.1f}x)")
    print(f"held-out passages given twice: perplexity of the second copy "
          f"{math.exp(copy_nll(model, held_stream, context)):.2f}")
    print("sample:", sample(model, tok, "And God said", 48, gen))
    write_model_dir(args.out, cfg, model, tok)
    print(f"wrote {args.out} in {time.time() - began:.0f} s with {args.threads} thread(s)")


if __name__ == "__main__":
    main()
