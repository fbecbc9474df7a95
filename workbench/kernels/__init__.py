"""The GPU kernels: their source, their launches, and Metal on a CPU.

``source`` composes ``kernels/`` (one body an algorithm over ``common.h``) into the Metal
or CUDA text MLX compiles, and fingerprints it; ``launch`` turns a tail's weights and fold
plan into the three tail launches and the head launch on ``cuda``, ``metal`` or
``metal-emulated``; ``one_launch`` runs the tail as ONE CUDA launch with grid barriers;
``gdn_step`` a Gated DeltaNet decode step as one launch; ``metal_emulation`` compiles
Metal with clang against a stand-in ``<metal_stdlib>`` and runs it on the CPU;
``cuda_device`` reads the GPU's multiprocessor count.
"""
