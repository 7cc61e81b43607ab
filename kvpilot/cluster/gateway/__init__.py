"""The local cluster's Gateway API stand-in: HTTPRoutes on the API server -> nginx configuration.

On a real cluster the user's Gateway API implementation (Envoy Gateway, Istio, ...) serves the
HTTPRoutes kvpilot writes. Locally, `kvpilot cluster up` starts this small controller instead:
it serves every Gateway of the GatewayClass `kvpilot-local`, accepts the subset of HTTPRoute that
kvpilot writes (header matches, weighted Service backendRefs), reports everything else in the
route's status, renders Debian nginx configuration and reloads it gracefully. docs/dev/local-fleet.md.
"""

CONTROLLER_NAME = "kvpilot.io/local-gateway"
GATEWAY_CLASS = "kvpilot-local"
GROUP = "gateway.networking.k8s.io"
UPSTREAM_HEADER = "X-Kvpilot-Upstream"  # response header: the pod address that served the request
