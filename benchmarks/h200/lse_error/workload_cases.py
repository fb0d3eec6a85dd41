import math,torch
from pathlib import Path
from dsa_bench.definitions import sparse_attention as A
from dsa_bench.solutions import import_entry,load_solution
from dsa_bench.workloads import build_inputs,derive_seed,load_workload
_,S=import_entry(load_solution(Path('solutions/triton')),A.NAME)
d=torch.device('cuda');W=[0.0]*5
for wn in ['sparse_attention_smoke','sparse_attention_h16']:
 w=load_workload(Path(f'workloads/{wn}.yaml'))
 for c in w.cases:
  for s in range(3):
   x=build_inputs(w.definition,c,derive_seed(w.settings.seed,c.id,'check',s),d)
   ax=w.definition.axes(c.axes);o=w.definition.allocate_outputs(ax,d)
   S.kernel(*w.definition.input_args(x),o['output'],o['lse']);torch.cuda.synchronize()
   r=A.reference(**x)
   i=x['sparse_indices'].long();v=i>=0;sf=i.clamp_min(0)
   ckv=torch.where(v[...,None],x['ckv_cache'].reshape(-1,512)[sf].double(),0.)
   kpe=torch.where(v[...,None],x['kpe_cache'].reshape(-1,64)[sf].double(),0.)
   lg=(torch.einsum('thd,tkd->thk',x['q_nope'].double(),ckv)+torch.einsum('thd,tkd->thk',x['q_pe'].double(),kpe))*x['sm_scale']
   lg=lg.masked_fill(~v[:,None,:],-math.inf);l=torch.logsumexp(lg,-1)/math.log(2)
   f=torch.isfinite(l);z=~v.any(1)
   ez=o['output'][z].float().abs().max().item() if z.any() else 0.0
   e=[(o['lse'].double()-l)[f].abs().max().item(),(r['lse'].double()-l)[f].abs().max().item(),(o['lse'].double()-r['lse'].double())[f].abs().max().item(),l[f].abs().max().item(),ez]
   W=[max(a,b) for a,b in zip(W,e)]
   print(c.id,s,' '.join(f'{t:.3e}' for t in e))
print('worst: sol-exact ref-exact sol-ref max|lse| empty-row-max|out|',W)
