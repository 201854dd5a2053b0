"""ledgermq's RocketMQ 5 proxy: Apache's ``apache.rocketmq.v2.MessagingService`` over gRPC, in
front of the nameservers and every broker group, speaking ledgermq's remoting protocol to them.

Stateless, as RocketMQ 5's proxy in cluster mode: routes come from the nameservers, sends go
to the masters, and what a consumer received and not yet acked (its invisible time, receipt
handle, delivery attempts) is the brokers' POP state in each group's replicated log, so any
number of proxies may run and any one may be restarted. Start one with ``python -m proxy``.
"""
