"""What every backend and front end shares, naming no backend: the problem, checks, options, errors,
timers, results, tuning records, the backend registry, the grad slot, the isolation worker."""
