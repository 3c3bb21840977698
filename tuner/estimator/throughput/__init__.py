"""Throughput: a step's predicted time and tokens per second (:mod:`.prediction`) from the model's FLOPs
(:mod:`.flops`) and the devices' rates (:mod:`.hardware`).
"""
