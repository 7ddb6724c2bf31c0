"""A cluster of hosts on one machine: network namespaces as hosts, veth cables, a bridge as the switch.

`hosts` builds and removes a cluster and shapes its links, `jobs` places MPI ranks on its hosts,
`slurm` runs a Slurm whose nodes are its hosts, `pingpong` measures a link. Root and Linux network
namespaces are needed; without them every verb says why in one line and exits with status 3.
"""
