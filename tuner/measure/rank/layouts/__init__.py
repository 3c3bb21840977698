"""What a rank applies of a trial's parallel layout: AutoTP (``autotp``), AutoEP (``autoep``), Ulysses sequence
parallelism (``ulysses``) and ALST's tiled MLP and checkpoint offload (``alst``)."""
