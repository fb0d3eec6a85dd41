import torch
from pathlib import Path
from dsa_bench.definitions import sparse_attention as A
from dsa_bench.solutions import import_entry,load_solution
from dsa_bench.workloads import build_inputs,derive_seed,load_workload
_,sa=import_entry(load_solution(Path('solutions/triton')),A.NAME)
d=torch.device('cuda');w=load_workload(Path('workloads/sparse_attention_h16.yaml'))
co=sa._max_coresident_programs(d);W={}
def plans(T):
 ps=[('default',None)]
 ps+=[(f'{p}{s}',sa.cuda_kernel_plan(p,s)) for p in ('cuda','cuda_two_launch') for s in (8,16,32,64)]
 ps+=[(f'cluster{s}',sa.cuda_kernel_plan('cuda_cluster',s)) for s in (8,16)]
 ps+=[('triton',sa.triton_gpu_plan(T,co)),('triton2',sa.triton_gpu_plan(T,co,True)),('dsplit',sa.Plan('dsplit',16,64,8,2))]
 return ps
for c in [w.cases[i] for i in (0,6,10,12,18,19,22)]:
 for s in range(2):
  x=build_inputs(w.definition,c,derive_seed(w.settings.seed,c.id,'check',s),d);ax=w.definition.axes(c.axes)
  for sc in (None,1.0):
   y=dict(x) if sc is None else dict(x,sm_scale=sc);r=A.reference(**y);f=torch.isfinite(r['lse'])
   for n,p in (plans(ax['num_tokens']) if sc is None else [('default@scale1',None)]):
    o=w.definition.allocate_outputs(ax,d)
    try: sa.sparse_attention(*w.definition.input_args(y),o['output'],o['lse'],plan=p);torch.cuda.synchronize()
    except Exception as ex: print(n,ex);continue
    e=(o['lse'].double()-r['lse'].double())[f].abs().max().item();W[n]=max(W.get(n,0),e)
    if sc: print(c.id,s,'max|lse|',r['lse'][f].abs().max().item(),'err',e)
for n,e in W.items(): print(f'{n:16s} {e:.3e}')
