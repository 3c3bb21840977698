"""Activations: what a rank's forward pass saves for backward and the workspaces around it.

What each layer and the loss save, traced or by formula (:mod:`.saved`), the CUDA attention kernels' extra
(:mod:`.attention`), DeepSpeed's chunked loss (:mod:`.chunked_loss`), and their place in a step's phases with
backward's early worst moments (:mod:`.activation_phases`).
"""
