"""Running a session: arms, their servers, placement, load, telemetry, rounds, resume."""
