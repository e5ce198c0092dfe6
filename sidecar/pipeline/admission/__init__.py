"""Admission: a request checked completely (`planner`), then its leases taken all or
nothing; what an encode is asked (`requests`) and planned to make (`plans`); a stream's
chunks checked and queued one by one (`intake`); which clients wait (`activity`)."""
