"""Example handlers named by conf/fleet.example.toml, so `fleetd check -c
conf/fleet.example.toml` imports real code. Replace them with your own."""
