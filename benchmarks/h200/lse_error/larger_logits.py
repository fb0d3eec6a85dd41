import math,torch
from pathlib import Path
from dsa_bench.definitions import sparse_attention as A
from dsa_bench.definitions.base import InputRng
from dsa_bench.solutions import import_entry,load_solution
_,sa=import_entry(load_solution(Path('solutions/triton')),A.NAME)
d=torch.device('cuda');co=sa._max_coresident_programs(d);W={}
def ex(x):
 i=x['sparse_indices'].long();v=i>=0;sf=i.clamp_min(0)
 ckv=torch.where(v[...,None],x['ckv_cache'].reshape(-1,512)[sf].double(),0.)
 kpe=torch.where(v[...,None],x['kpe_cache'].reshape(-1,64)[sf].double(),0.)
 lg=(torch.einsum('thd,tkd->thk',x['q_nope'].double(),ckv)+torch.einsum('thd,tkd->thk',x['q_pe'].double(),kpe))*x['sm_scale']
 return torch.logsumexp(lg.masked_fill(~v[:,None,:],-math.inf),-1)/math.log(2)
for seed in range(14,20):
 for counts in ([2048,40,0,2047,1],[2048]*8):
  ax=A.DEFINITION.axes({'num_tokens':len(counts),'num_pages':1024})
  x=A.generate(ax,{},{'sparse_indices':{'valid_counts':counts,'padding':'scattered'}},InputRng(seed,d))
  T=len(counts)
  for sc in (1.0,0.5,A.CONTEST_SM_SCALE):
   y=dict(x,sm_scale=sc);r=A.reference(**y);l=ex(y);f=torch.isfinite(r['lse'])
   for n,p in [('default',None),('triton',sa.triton_gpu_plan(T,co)),('dsplit',sa.Plan('dsplit',16,64,8,2))]:
    o=A.DEFINITION.allocate_outputs(ax,d)
    sa.sparse_attention(*A.DEFINITION.input_args(y),o['output'],o['lse'],plan=p);torch.cuda.synchronize()
    k=(n,round(sc,3))
    e=[(o['lse'].double()-r['lse'].double())[f].abs().max().item(),(o['lse'].double()-l)[f].abs().max().item(),(r['lse'].double()-l)[f].abs().max().item(),l[f].abs().max().item()]
    W[k]=[max(a,b) for a,b in zip(W.get(k,[0]*4),e)]
for k,e in W.items(): print(k,'sol-ref %.3e sol-exact %.3e ref-exact %.3e max|lse| %.1f'%tuple(e))
