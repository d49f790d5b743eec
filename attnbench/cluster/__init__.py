"""A sweep's shards as a Slurm job array: the submission folder and the task every array element runs
(``submission``), and the array itself through submitit (``jobarray``). Imports ``core``, ``config``, ``results``
and ``sweeps``."""
