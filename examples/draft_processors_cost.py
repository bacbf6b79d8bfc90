"""ms to process and draw g draft rows at temperature 0.7, top-p 0.9: transformers' warpers + multinomial (06cbf2a)
against draft_processors + sample_rows (this checkout), on logits of the shipped drafter's scale."""
import time, torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper
from hf_specdiff.generation_specdiff import draft_processors, select_tokens
torch.set_num_threads(2); torch.manual_seed(0)
def ms(f, n=100):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e3
procs = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
for g in (1, 4, 8, 16):
    logits = torch.randn(g, 49152) * 4
    old = ms(lambda: torch.multinomial(procs(None, logits).softmax(-1), 1))
    new = ms(lambda: select_tokens(draft_processors(procs)(None, logits), True))
    print(f"{g} rows: transformers' warpers + multinomial {old:.2f} ms, draft_processors + sample_rows {new:.2f} ms")
