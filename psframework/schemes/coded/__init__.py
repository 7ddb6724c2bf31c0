"""Coded model-parallel schemes (`sazd`, `poly`, `uncoded`, `sazd-naive`), one module per concern.

layers.py     the coded convolution identities: how a layer is cut, coded, computed and decoded
state.py      the conv state between rank 0 and the workers: flat, encoded by each worker, decoded
plan.py       the command plan of an iteration: the coded passes, in the order both sides follow
remote.py     remote convolutions: rank 0's model with its coded Conv2d computed elsewhere
core.py       the algorithm apart from MPI: rank 0 decoding through an Exchange, a worker encoding and updating
dissemination.py  the strategies that deliver a pass's tensor to every worker (comm.dissemination)
setup.py      what server, workers and exchange share: the code, coded layers, command plan, dissemination
exchange.py   the Exchange over MPI (one round per coded pass) and its byte model
server.py, worker.py  the MPI sides of sazd, poly and uncoded (distributed encoding and updating)
naive.py      the MPI sides of sazd-naive: rank 0 encodes, ships coded weights and updates
"""
