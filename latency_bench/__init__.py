"""latency_bench"""
