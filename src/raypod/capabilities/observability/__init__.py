"""Observability out of the box: Prometheus discovers every Ray node of every cluster (labelled with
``ray_io_cluster``, as Ray's own dashboards expect), raypod exports its own metrics, dashboards are derived from
the ones Ray generates, and the console charts a cluster from PromQL."""
