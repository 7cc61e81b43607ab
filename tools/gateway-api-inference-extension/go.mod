module kvpilot/tools/gateway-api-inference-extension

go 1.26.0

require sigs.k8s.io/gateway-api-inference-extension v1.4.0
