"""The vocabulary every other room shares, stdlib only: errors and exit codes, units and all number formatting,
statistics, the catalogue of model names, cases and timing policies, FLOP formulas, vendor peak figures."""
