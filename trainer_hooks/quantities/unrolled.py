"""Exact per-timestep ∂L/∂h_t of a fused recurrent module (opt-in, sampled steps).

The fused kernels (cuDNN, and PyTorch's CPU kernel) never materialise h_t as a tensor
of its own, so nothing can be hooked on it. On a sampled step the forward hook
therefore recomputes the module's output with the same parameters, one timestep at a
time, each timestep through the module's own fused kernel on a length-1 sequence, and
returns that output in place of the fused one. Each top-layer h_t (and c_t for an
LSTM) carries a tensor hook that keeps its gradient, the total derivative through
every later timestep; when the step closes, all of them become float64 norms at once
(:class:`_TopLayer`). The input of every layer i ≥ 1 gets a hook too: ``layer<i>``.

Cost on a sampled step (docs/CAPTURE.md): the fused forward still runs (its graph is
dropped), plus one kernel call per timestep forward and backward: about 3x the whole
training step of the 121-step LSTM in ``bench/overhead.py`` on CPU. Outputs and
gradients equal the fused module's to floating-point rounding;
inter-layer dropout in training mode draws its own mask. Not supported (the step
keeps its fused output and only the ``input`` series): ``PackedSequence`` inputs and
LSTM ``proj_size``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import _VF, nn

from .calls import F64, Call, accumulate, hook_tensor


def _layer_input_hook(call: Call, name: str) -> Any:
    kept: list[torch.Tensor | None] = [None]

    def hook(grad: torch.Tensor) -> None:
        kept[0] = accumulate(kept[0], grad)
        call.fired = True

    def finalize() -> None:
        if kept[0] is not None:
            with torch.no_grad():
                call.series[name] = torch.linalg.vector_norm(kept[0], dim=(1, 2), dtype=F64)

    call.finalizers.append(finalize)
    return hook


def _one_step(
    module: nn.RNNBase,
    x_t: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor | None,
    params: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One timestep of one layer and direction, through the module's own fused kernel.

    The kernel is called on a sequence of length 1 with that layer's parameters, so
    the arithmetic is the module's own; h_t is read from the returned state (not from
    the output, which is the same values as a second tensor), so a hook on it sees
    every use of h_t.
    """
    bias = bool(module.bias)
    train = module.training
    if module.mode == "LSTM":
        assert c is not None
        _, h1, c1 = _VF.lstm(x_t, (h[None], c[None]), params, bias, 1, 0.0, train, False, False)
        return h1[0], c1[0]
    fn = {"GRU": _VF.gru, "RNN_TANH": _VF.rnn_tanh, "RNN_RELU": _VF.rnn_relu}[module.mode]
    _, h1 = fn(x_t, h[None], params, bias, 1, 0.0, train, False, False)
    return h1[0], None


class _TopLayer:
    """Keeps the top layer's per-timestep gradients; norms them all at once at step end.

    The fused step kernel returns c_t as a state tensor, but computes h_t from its own
    copy of c_t, so a hook on the returned c_t sees only the path through later
    timesteps. The total ∂L/∂c_t adds the path through h_t = o_t ⊙ tanh(c_t):
    ∂L/∂h_t ⊙ o_t ⊙ (1 − tanh²(c_t)), with o_t recomputed from the saved inputs in one
    matmul per direction, in float64.
    """

    def __init__(self, module: nn.RNNBase, call: Call, dirs: int, steps: int) -> None:
        self.module = module
        self.call = call
        self.steps = steps
        self.grad_h: list[list[torch.Tensor | None]] = [[None] * steps for _ in range(dirs)]
        self.grad_c: list[list[torch.Tensor | None]] = [[None] * steps for _ in range(dirs)]
        # per direction: (layer input, h entering each step, c_t per step, params)
        self.saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]] = []
        call.series["hidden"] = None
        if module.mode == "LSTM":
            call.series["cell"] = None
        call.finalizers.append(self.finalize)

    def hook(self, tensor: torch.Tensor, grads: list[torch.Tensor | None], t: int) -> None:
        def keep(grad: torch.Tensor) -> None:
            grads[t] = accumulate(grads[t], grad)
            self.call.fired = True

        hook_tensor(tensor, keep)

    def finalize(self) -> None:
        with torch.no_grad():
            hidden, cell = [], []
            for d, grads in enumerate(self.grad_h):
                if all(g is None for g in grads):
                    return  # no backward reached this call
                g_h = _stack64(grads)
                hidden.append(torch.linalg.vector_norm(g_h, dim=(1, 2)))
                if self.module.mode == "LSTM":
                    x, h_prev, c, params = self.saved[d]
                    size = self.module.hidden_size
                    w_ih, w_hh = params[0][3 * size :], params[1][3 * size :]
                    gate = F.linear(x.to(F64), w_ih.to(F64))
                    gate = gate + F.linear(h_prev.to(F64), w_hh.to(F64))
                    if len(params) == 4:
                        gate = gate + params[2][3 * size :].to(F64) + params[3][3 * size :].to(F64)
                    tanh_c = c.to(F64).tanh()
                    total = _stack64(self.grad_c[d], like=g_h) + g_h * gate.sigmoid() * (
                        1 - tanh_c.square()
                    )
                    cell.append(torch.linalg.vector_norm(total, dim=(1, 2)))
            self.call.series["hidden"] = torch.stack(hidden)
            if cell:
                self.call.series["cell"] = torch.stack(cell)


def _stack64(grads: list[torch.Tensor | None], like: torch.Tensor | None = None) -> torch.Tensor:
    """Stack per-timestep gradients as float64, zeros where none arrived."""
    template = next((g for g in grads if g is not None), None)
    if template is None:
        assert like is not None
        return torch.zeros_like(like)
    zero = torch.zeros_like(template)
    return torch.stack([zero if g is None else g.detach() for g in grads]).to(F64)


def unrolled_forward(module: nn.RNNBase, x: torch.Tensor, hx: Any, call: Call) -> Any:
    """The module's output, recomputed per timestep with hooks on every h_t (and c_t)."""
    if not x.is_cuda:
        return _unrolled(module, x, hx, call)
    # cuDNN would copy (and warn about) the per-layer weights at every call, and refuse
    # backward in eval mode; PyTorch's native CUDA kernels take them as they are.
    with torch.backends.cudnn.flags(enabled=False):
        return _unrolled(module, x, hx, call)


def _unrolled(module: nn.RNNBase, x: torch.Tensor, hx: Any, call: Call) -> Any:
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
    top_layer = _TopLayer(module, call, dirs, steps)
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
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if module.bias else [])
            params = [getattr(module, f"{n}_{sfx}") for n in names]
            h = h0[layer * dirs + direction]
            c = c0[layer * dirs + direction] if c0 is not None else None
            hs: list[torch.Tensor] = [h] * steps
            entering: list[torch.Tensor] = [h] * steps
            cs: list[torch.Tensor] = [h] * steps
            order = range(steps) if direction == 0 else range(steps - 1, -1, -1)
            for t in order:
                entering[t] = h
                h, c = _one_step(module, layer_input[t : t + 1], h, c, params)
                if top:
                    top_layer.hook(h, top_layer.grad_h[direction], t)
                    if c is not None:
                        top_layer.hook(c, top_layer.grad_c[direction], t)
                        cs[t] = c
                hs[t] = h
            if top and lstm:
                top_layer.saved.append(
                    (
                        layer_input.detach(),
                        torch.stack(entering).detach(),
                        torch.stack(cs).detach(),
                        [p.detach() for p in params],
                    )
                )
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
