"""Peers of this workdir, timed beside the custom path: the layer rewritten on PyTorch's SDPA."""

import torch.nn as nn
import torch.nn.functional as F


class SdpaAttention(nn.Module):
    """model.Model with F.scaled_dot_product_attention(is_causal=True); same init args and state dict."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0, "n_head must divide n_embd"
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_embd = n_embd
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


# name -> module class taking model.Model's init args and loading its state dict.
PEERS = {"sdpa": SdpaAttention}
