"""The 1F1B-flush pipeline schedule (PipeDream-Flush; paper Sec. 2.2 and Eq. (9)) with p2p send/recv.

Stage i of P runs min(P − i − 1, m) warm-up forwards, then alternates one forward and one backward
until every micro-batch has gone forward, then drains the remaining backwards. At most min(P − i, m)
micro-batches are in flight on stage i — what gbmw.cost.pipeline_schedules.in_flight_micro_batches charges for memory.
Neighbouring stages exchange activations forward and gradients backward with paired non-blocking
send/recv (Megatron's send_forward_recv_backward / send_backward_recv_forward), so two neighbours
never both block in a send.

A stage before the last keeps each micro-batch's output only as the root of its backward: once the tensor to send
is handed over (it holds the storage), the root's data is replaced by one element (`release_sent_output`,
megatron-core's `deallocate_output_tensor`) and backward starts from it through the autograd engine directly
(`backward_from_released`, megatron-core's `custom_backward`: torch.autograd.backward would check the gradient's
shape against the one-element root). So up to P − i micro-batches in flight do not each hold their sent output.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.distributed as dist


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> Iterator[tuple[str, int]]:
    """("forward" | "backward", micro-batch index) in the order stage `stage` runs them."""
    warm_up = min(stages - stage - 1, micro_batches)
    for index in range(warm_up):
        yield "forward", index
    for step in range(micro_batches - warm_up):
        yield "forward", warm_up + step
        yield "backward", step
    for index in range(micro_batches - warm_up, micro_batches):
        yield "backward", index


def release_sent_output(output: torch.Tensor) -> torch.Tensor:
    """The tensor to send (sharing `output`'s storage); `output` keeps its graph and one element of data. `output`
    must be a tensor of its own, not a view (its storage is what is handed over)."""
    from megatron.core.pipeline_parallel.schedules import deallocate_output_tensor

    sent = output.detach()
    deallocate_output_tensor(output, deallocate_pipeline_outputs=True)
    return sent


def backward_from_released(output: torch.Tensor, grad: torch.Tensor) -> None:
    """Back-propagate `grad` (the full output's gradient) from a root released by `release_sent_output`."""
    from megatron.core.pipeline_parallel.schedules import custom_backward

    custom_backward(output, grad)


class PipelineLinks:
    """p2p with the same local rank of the previous and next stage (None at the ends)."""

    def __init__(self, previous_rank: int | None, next_rank: int | None):
        self.previous_rank, self.next_rank = previous_rank, next_rank

    def exchange(self, send: list[tuple[torch.Tensor, int]], receive: list[tuple[torch.Tensor, int]]) -> None:
        """Post every send and receive, then wait for all: no ordering between them can deadlock."""
        requests = [dist.isend(tensor, peer) for tensor, peer in send if peer is not None]
        requests += [dist.irecv(tensor, peer) for tensor, peer in receive if peer is not None]
        for request in requests:
            request.wait()


def run_schedule(
    stage: int,
    stages: int,
    micro_batches: int,
    links: PipelineLinks,
    forward: Callable[[int, torch.Tensor | None], torch.Tensor | None],
    backward: Callable[[int, torch.Tensor | None], torch.Tensor | None],
    activation_shape: Callable[[str], tuple[tuple[int, ...], torch.dtype, torch.device]],
) -> None:
    """Run one iteration of 1F1B on this stage.

    `forward(j, received)` runs micro-batch j through the stage and returns the activation to send on
    (None on the last stage); `backward(j, received_grad)` back-propagates it and returns the
    gradient of the stage's input to send back (None on the first stage). `activation_shape("in")` /
    `("out")` give the shapes of the tensors received from the previous / next stage.
    """
    first, last = stage == 0, stage == stages - 1

    def empty(which: str) -> torch.Tensor:
        shape, dtype, device = activation_shape(which)
        return torch.empty(shape, dtype=dtype, device=device)

    pending_input: dict[int, torch.Tensor] = {}
    pending_grad: dict[int, torch.Tensor] = {}
    order = list(one_f_one_b(stage, stages, micro_batches))
    for position, (kind, index) in enumerate(order):
        if kind == "forward":
            received = pending_input.pop(index, None)
            if received is None and not first:
                received = empty("in")
                links.exchange([], [(received, links.previous_rank)])
            output = forward(index, received)
            # Post the send together with the receive the next action needs (1F1B steady state).
            following = order[position + 1] if position + 1 < len(order) else None
            receive = []
            if following is not None and following[0] == "backward" and not last:
                grad = empty("out")
                pending_grad[following[1]] = grad
                receive.append((grad, links.next_rank))
            links.exchange([(output, links.next_rank)] if not last else [], receive)
        else:
            grad = pending_grad.pop(index, None)
            if grad is None and not last:
                grad = empty("out")
                links.exchange([], [(grad, links.next_rank)])
            input_grad = backward(index, grad)
            following = order[position + 1] if position + 1 < len(order) else None
            receive = []
            if following is not None and following[0] == "forward" and not first:
                received = empty("in")
                pending_input[following[1]] = received
                receive.append((received, links.previous_rank))
            links.exchange([(input_grad, links.previous_rank)] if not first else [], receive)
