"""Elastic runs in the lab: a Lighthouse and one process per replica, on torchft.

:mod:`~dssync.lab.elastic.launch` starts them (``dssync train --elastic``), restarts a lost
replica after a delay as an orchestrator would, and reads what each wrote;
:mod:`~dssync.lab.elastic.replica` is one replica's training loop;
:mod:`~dssync.lab.elastic.methods` builds what a replica trains with: dssync's ElasticDSSync or
torchft's own DiLoCo and LocalSGD (the real ones, from ``torchft.local_sgd``). Importing this
package needs torchft only when a replica runs.
"""
