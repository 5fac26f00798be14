"""What every backend and front end shares, naming no backend: the problem, checks, options, errors,
timers, results, tuning records, the backend registry, the grad slot, the isolation worker."""

__version__ = "0.1.0"   # rawconv.__version__ (records and `rawconv info` carry it; core, so every layer reads it)
