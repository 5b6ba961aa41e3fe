"""What to change at a call site whose backend cost more than the fastest allowed one: the lines a user writes.

Three kinds of fix, most local first:
- **pin**: run the site's calls under `torch.nn.attention.sdpa_kernel([SDPBackend.X])`, for one shape class when the
  others are better left alone (`attnprof audit --pin decode=flash` applies it to the audited run);
- **knob**: switch the backend that ran off for the process (`torch.backends.cuda.enable_cudnn_sdp(False)`), only
  when SDPA's next choice here, in its own priority order, is the measured fastest;
- **implementation**: a different attention for the model (`attn_implementation="flex_attention"`, a kernel repo,
  or a user function registered with transformers' `AttentionInterface`).
"""

from __future__ import annotations

from attnprof.dispatch.sdpa_checks import ranked_backends

_ENUM = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH",
         "cpu_flash": "FLASH_ATTENTION"}
_KNOB = {"flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp", "cudnn": "enable_cudnn_sdp",
         "cpu_flash": "enable_flash_sdp", "math": "enable_math_sdp"}


def pin_backend(arm: str, backend: str | None) -> str | None:
    """The `--pin` backend name for an SDPA arm (`sdpa-flash` → flash; `sdpa` → the backend it reached)."""
    if arm.startswith("sdpa-"):
        return arm.removeprefix("sdpa-")
    if arm == "sdpa" and backend in _ENUM:
        return "flash" if backend == "cpu_flash" else backend
    return None


def knob_reaches(ran: str, device: str) -> str | None:
    """The backend SDPA would take here (by its priority order) with the one that ran switched off."""
    order = [b for b in ranked_backends(device) if b != ran]
    return order[0] if order else None


def fixes(*, shape_class: str, ran: str, best_arm: str, best_backend: str | None, device: str) -> list[str]:
    """The fixes for one site, as lines of text (code in backticks)."""
    out: list[str] = []
    pin = pin_backend(best_arm, best_backend)
    if pin is not None:
        out.append(f"pin: `with sdpa_kernel([SDPBackend.{_ENUM[pin]}]):` around the {shape_class} calls "
                   f"(attnprof: `--pin {shape_class}={pin}`)")
        target = "cpu_flash" if pin == "flash" and not device.startswith("cuda") else pin
        if ran in _KNOB and ran != target and knob_reaches(ran, device) == target:
            out.append(f"knob: `torch.backends.cuda.{_KNOB[ran]}(False)` (SDPA's next choice here is {target}; "
                       "process-wide, every phase)")
    elif best_arm == "flex":
        out.append('implementation: `attn_implementation="flex_attention"` (compiled FlexAttention)')
    elif best_arm == "kernel":
        out.append("implementation: the kernel repo's `flash_attn_func` through transformers' kernel loading "
                   "(`attn_implementation=\"<org>/<kernel-repo>\"`) or attnprof's adapter")
    elif ":" in best_arm:
        out.append(f"implementation: register `{best_arm}` with `transformers.AttentionInterface.register(name, fn)` "
                   "and load the model with `attn_implementation=name`")
    return out
