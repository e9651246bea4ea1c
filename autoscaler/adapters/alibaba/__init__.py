"""Alibaba Cloud notice sources and spot prices: the Recycling lock on DescribeInstances,
CloudMonitor preemptible-interruption events (polled and pushed to a webhook) and
DescribeSpotPriceHistory. Import the modules directly.
"""
