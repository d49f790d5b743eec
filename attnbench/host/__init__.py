"""What attnbench knows about the machine it runs on: devices (``devices``), the environment a run records
(``inventory``), whether the machine is busy (``busy``), host memory readings (``memory``) and hardware telemetry
(``sensors``: NVML, GPM, psutil). Never prints or exits. Imports ``core``, ``families`` and ``results``."""
