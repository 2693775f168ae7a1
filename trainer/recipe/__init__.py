"""The reference training recipe's pieces that are neither the network nor the loop.

    batch.py   the micro-batch contract (CleanBatch, MicroBatch, the checks a batch must pass)
    draws.py   every random draw of one micro-batch (chunk, window, noise, text dropout), in one call
    losses.py  the flow-matching targets and losses (latent and action)

Import the module you need; this package re-exports nothing.
"""
