"""resident-gate: proves an engine change with alternated A/B server arms."""
