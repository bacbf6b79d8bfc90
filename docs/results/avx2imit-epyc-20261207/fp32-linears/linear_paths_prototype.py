import time, torch, torch.nn.functional as F
torch.set_num_threads(2); torch.set_grad_enabled(False)
print(torch.backends.cpu.get_cpu_capability())
shapes = [(576, 576), (192, 576), (1536, 576), (576, 1536)]  # (out, in)
def bench(fn, reps=30):
    fn(); ts=[]
    for _ in range(reps):
        s=time.perf_counter(); fn(); ts.append(time.perf_counter()-s)
    ts.sort(); return ts[len(ts)//2]*1e6
for m in (1, 2, 4, 8, 16):
    for out, inp in shapes:
        W = torch.randn(out, inp).bfloat16(); W32 = W.float(); x = torch.randn(1, m, inp).bfloat16()
        a = bench(lambda: F.linear(x, W))
        b = bench(lambda: F.linear(x.float(), W.float()).bfloat16())
        c = bench(lambda: F.linear(x.float(), W32).bfloat16())
        print(f"m={m:2d} {out}x{inp}: bf16 {a:7.1f}us  upcast-per-call {b:7.1f}us  cached-fp32 {c:7.1f}us")
