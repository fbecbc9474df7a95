"""The GPU kernels: their source, their launches, and Metal on a CPU.

``source`` composes ``kernels/`` (one body an algorithm over ``common.h``) into the Metal
or CUDA text MLX compiles, and fingerprints it. ``tuning`` holds the launches' group
sizes and grids and the hardware limits; ``matrices`` a weight matrix as kernel inputs
and the group memory a launch declares; ``launch`` prepares a tail's three launches from
its weights and fold plan; ``run`` runs a tail on ``metal`` or ``metal-emulated`` (and the
CUDA path's fallback); ``head`` the Q/K/V launch; ``emulated`` the Metal launches on the
CPU and the Metal source MLX generates; ``one_launch`` the CUDA tail as ONE launch with
grid barriers; ``next_norm`` the next layer's input norm a tail's launch also computes; ``gdn_step`` a Gated DeltaNet decode step as one launch;
``metal_emulation`` compiles Metal and runs it on the CPU (the emulated kernel, its launch
and schedules) over ``metal_translation`` (MLX's Metal source made C++), ``metal_toolchain``
(clang against a stand-in ``<metal_stdlib>``, the compile cache) and ``metal_memory`` (the
fiber stacks and guarded buffers kept between launches); ``metal_drop_in`` is ``metal_kernel``, a drop-in for
``mx.fast.metal_kernel`` that runs a user's Metal source there; ``cuda_device`` reads the GPU's multiprocessor count.
"""
