"""The systems under test: how each one's nodes start and stop, its fault primitives, its client adapters.

``base`` holds what every system shares (the :class:`~jepsen.systems.base.Backend` a run
loads and breaks, and the process handling of local nodes); ``clients`` the adapter
interface the workloads call. One module per system: ``ledger``, ``broker`` (with its
docker-compose backend in ``docker``), ``rocketmq`` (a cluster someone else runs),
``rocketmq_rust``, ``syncobj`` (with its node program, ``syncobj_node``) and ``proxy_system``
(the broker group behind RocketMQ 5's gRPC proxy, its clients in ``proxy_client``). ``registry``
names them; ``broken`` holds the deliberately broken adapters of the harness's self-test.
"""
