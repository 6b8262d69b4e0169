//! JSONPath subset used by additionalPrinterColumns and `kubectl get -o jsonpath`.
