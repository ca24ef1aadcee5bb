"""The gradients both kinds of edges take (edges.py, edges_postnorm.py): the first layer's input interpolated for
EAP-IG, dm/d(a projection's input) for each head alone through its rows, and vector-Jacobian products through a
norm module, by autograd over a copy of its input per receiver."""

from __future__ import annotations


def interpolated(clean, corrupted, steps: int):
    """(C, N, D), C = steps, requiring grad: the first layer's input of the corrupted run (Recorded) moved towards the
    clean one's, e_k = e_corrupt + (k / steps) (e_clean - e_corrupt), k = 0 .. steps - 1 (EAP-IG's; EAP's alone: 1)."""
    import torch

    start, end = (each.entering(0).detach().clone().double() for each in (corrupted, clean))  # (1, N, D)
    alphas = torch.arange(steps, dtype=torch.float64, device=start.device).view(-1, 1, 1) / steps
    return (start + alphas * (end - start)).to(corrupted.entering(0).dtype).requires_grad_(True)  # (C, N, D)


def through_rows(grad, projection: tuple, rows):
    """(C, N, n, D): dm/d(the projection's input) for each of its n heads alone, from grad (C, N, features), dm/d(the
    projection module's output); projection: capture.projection_slice's (module, first, n, d); rows (n * d, D) its
    weight's rows (nn.Linear's layout)."""
    _, offset, count, head_dim = projection
    grad = grad[..., offset : offset + count * head_dim]  # (C, N, n * d)
    per_head = grad.reshape(*grad.shape[:2], count, head_dim)  # (C, N, n, d)
    # (n, C * N, d) @ (n, d, D) -> (C, N, n, D)
    product = per_head.flatten(0, 1).transpose(0, 1) @ rows.view(count, head_dim, -1).to(grad.dtype)
    return product.transpose(0, 1).view(*grad.shape[:2], count, -1)


def through_norm(norm, x, wanted, mean: bool = True):
    """(N, R, D) float64: J_norm(x)^T wanted for each of R receivers' own copy of x (C, N, D), wanted (C, N, R, D), by
    autograd through the model's own norm module over R copies; the mean over the C copies (EAP-IG's steps). mean
    False: each copy's, (C, N, R, D) in x's dtype (a chain of norms: edges_postnorm.py)."""
    import torch

    with torch.inference_mode(False), torch.enable_grad():
        copies = x.unsqueeze(2).expand(*wanted.shape).clone().requires_grad_(True)  # (C, N, R, D)
        (result,) = torch.autograd.grad(norm(copies), copies, wanted.to(x.dtype))
    return result.double().mean(dim=0) if mean else result
