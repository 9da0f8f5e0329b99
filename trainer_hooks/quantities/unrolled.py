"""Exact per-timestep ∂L/∂h_t of a fused recurrent module (opt-in, sampled steps).

The fused kernels (cuDNN, and PyTorch's CPU kernel) never materialise h_t as a tensor
of its own, so nothing can be hooked on it. On a sampled step the forward hook
therefore recomputes the module's output with the same parameters, one timestep at a
time, with the same equations as ``nn.LSTM``/``nn.GRU``/``nn.RNN``, and returns that
output in place of the fused one. Each top-layer h_t (and c_t for an LSTM) carries a
tensor hook that writes ‖∂L/∂h_t‖₂ into a preallocated float64 buffer at index t: the
total derivative, through every later timestep. The input of every layer i ≥ 1 gets
a hook too: the ``layer<i>`` series.

Cost on a sampled step (docs/CAPTURE.md): the fused forward still runs (its graph is
dropped), plus a per-timestep forward and backward, a few times slower than the fused
kernels. Outputs and gradients equal the fused module's to floating-point rounding;
inter-layer dropout in training mode draws its own mask. Not supported (the step
keeps its fused output and only the ``input`` series): ``PackedSequence`` inputs and
LSTM ``proj_size``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .calls import F64, Call, hook_tensor


def _writer(buffer: torch.Tensor, call: Call) -> Any:
    def write(grad: torch.Tensor) -> None:
        with torch.no_grad():
            torch.linalg.vector_norm(grad.detach(), dtype=F64, out=buffer)
        call.fired = True

    return write


def _layer_input_hook(call: Call, name: str) -> Any:
    def hook(grad: torch.Tensor) -> None:
        with torch.no_grad():
            call.series[name] = torch.linalg.vector_norm(grad.detach(), dim=(1, 2), dtype=F64)
        call.fired = True

    return hook


def _cell_step(
    mode: str,
    xw_t: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor | None,
    w_hh: torch.Tensor,
    b_hh: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One timestep, the same equations as PyTorch's fused kernels."""
    gh = F.linear(h, w_hh, b_hh)
    if mode == "LSTM":
        assert c is not None
        i, f, g, o = (xw_t + gh).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if mode == "GRU":
        i_r, i_z, i_n = xw_t.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h, None
    pre = xw_t + gh
    return (torch.tanh(pre) if mode == "RNN_TANH" else torch.relu(pre)), None


def unrolled_forward(module: nn.RNNBase, x: torch.Tensor, hx: Any, call: Call) -> Any:
    """The module's output, recomputed per timestep with hooks on every h_t (and c_t)."""
    mode = module.mode
    lstm = mode == "LSTM"
    batched = x.dim() == 3
    seq = x if batched else x.unsqueeze(1)
    if batched and module.batch_first:
        seq = seq.transpose(0, 1)
    steps, batch = seq.shape[0], seq.shape[1]
    dirs = 2 if module.bidirectional else 1
    layers, hidden = module.num_layers, module.hidden_size
    if hx is None:
        h0 = seq.new_zeros(layers * dirs, batch, hidden)
        c0 = seq.new_zeros(layers * dirs, batch, hidden) if lstm else None
    else:
        h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
        if not batched:
            h0 = h0.unsqueeze(1)
            c0 = c0.unsqueeze(1) if c0 is not None else None
    hidden_norms = torch.zeros(dirs, steps, dtype=F64, device=seq.device)
    cell_norms = torch.zeros(dirs, steps, dtype=F64, device=seq.device) if lstm else None
    call.series["hidden"] = hidden_norms
    if cell_norms is not None:
        call.series["cell"] = cell_norms
    layer_input = seq
    last_h: list[torch.Tensor] = []
    last_c: list[torch.Tensor] = []
    for layer in range(layers):
        top = layer == layers - 1
        if layer > 0:
            if module.dropout and module.training:
                layer_input = F.dropout(layer_input, module.dropout, training=True)
            call.series[f"layer{layer}"] = None
            hook_tensor(layer_input, _layer_input_hook(call, f"layer{layer}"))
        outputs: list[torch.Tensor] = []
        for direction in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if direction else "")
            w_ih = getattr(module, f"weight_ih_{sfx}")
            w_hh = getattr(module, f"weight_hh_{sfx}")
            b_ih = getattr(module, f"bias_ih_{sfx}") if module.bias else None
            b_hh = getattr(module, f"bias_hh_{sfx}") if module.bias else None
            xw = F.linear(layer_input, w_ih, b_ih)  # every timestep's input part at once
            h = h0[layer * dirs + direction]
            c = c0[layer * dirs + direction] if c0 is not None else None
            hs: list[torch.Tensor] = [h] * steps
            order = range(steps) if direction == 0 else range(steps - 1, -1, -1)
            for t in order:
                h, c = _cell_step(mode, xw[t], h, c, w_hh, b_hh)
                if top:
                    hook_tensor(h, _writer(hidden_norms[direction, t], call))
                    if c is not None and cell_norms is not None:
                        hook_tensor(c, _writer(cell_norms[direction, t], call))
                hs[t] = h
            outputs.append(torch.stack(hs))
            last_h.append(h)
            if c is not None:
                last_c.append(c)
        layer_input = outputs[0] if dirs == 1 else torch.cat(outputs, dim=2)
    output = layer_input
    h_n = torch.stack(last_h)
    c_n = torch.stack(last_c) if lstm else None
    if batched and module.batch_first:
        output = output.transpose(0, 1)
    if not batched:
        output = output.squeeze(1)
        h_n = h_n.squeeze(1)
        c_n = c_n.squeeze(1) if c_n is not None else None
    return (output, (h_n, c_n)) if lstm else (output, h_n)
