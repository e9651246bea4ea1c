"""The node agent: instance metadata (AWS IMDSv2, Alibaba) -> the notice annotation on its Node."""
