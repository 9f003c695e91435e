"""The broker's front: client sockets, admission, responses, shared-memory registrations
and leases."""
