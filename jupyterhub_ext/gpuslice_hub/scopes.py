"""The JupyterHub scopes gpuslice defines and asks for: one home for their names.

The two custom scopes are part of gpuslice's interface, as JupyterHub's own scopes are of
JupyterHub's: ``configure_jupyterhub`` defines them and the roles that carry them, the
service checks for them, and the docs name them. They are not settings: a renamed scope
would have to be renamed in each of those places at once, and a site gains nothing by it
(it grants them to whom it likes through JupyterHub's roles)."""

# Makes a user (or a token) a gpuslice admin: the admin panel, every user's jobs and
# allocations, the admin actions. Includes what the metrics scope allows.
ADMIN_SCOPE = "custom:gpuslice:admin"
# Lets a token scrape /metrics and nothing else (for Prometheus' service).
METRICS_SCOPE = "custom:gpuslice:metrics"

# What the service's own token needs of the hub (configure_jupyterhub gives it a role with
# these; "{name}": the service's name).
SERVICE_SCOPES = [
    # reconcile allocations against servers, and stop servers whose slice is reclaimed
    "list:users",
    "read:users",
    "read:users:name",
    "read:users:groups",
    "read:servers",
    "servers",
    "read:groups",
    # the spawner uses the service's own token; it must pass the service's access check
    "access:services!service={name}",
]
