"""AWS notice sources and spot prices: the EventBridge -> SQS consumer, EC2 instance -> node
lookup and DescribeSpotPriceHistory. Import the modules directly (this package imports nothing,
so the SDK-free `loop` and `sources` modules stay cheap for the other sources).
"""
