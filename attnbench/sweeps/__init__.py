"""Running a sweep: planning it (``runner.plan_sweep``), the run folder it writes into (``runner.open_sweep``,
``runner.Sweep``), the loop over cases (``loop``), the worker processes cases run in (``isolated_executor``,
``replicated_executor``, ``pool``: one worker per device) and the progress events a listener hears (``events``).
Never prints, exits or installs a signal handler. Imports ``core``, ``families``, ``config``, ``results``, ``host``
and ``timing``."""
