import json,math
files=['reproduce_h200_session11_r6','reproduce_h100_session14_r6','reproduce_h100_session16','reproduce_h100_session17']
for delta in [0,30]:
  for comb in ['linear','quad']:
    tot=none=0
    for f in files:
        d=json.load(open(f'benchmarks/results/{f}.json'))
        refus={o['name']:o.get('ref_median_us') for o in d['per_operator']}
        for name,runs in d['identical_runs'].items():
            t=refus.get(name)
            if t is None:
                m=[k for k in refus if k.startswith(name[:12])]; t=refus[m[0]] if m else None
            for r in runs:
                if r.get('speedup') is None or not r.get('ci95') or t is None: continue
                w=(math.log(r['ci95'][1])-math.log(r['ci95'][0]))/2; b=math.log(r['bound'])
                # ci95 is already the re-run interval of the replicates
                tau=delta/1000*math.sqrt(2)/t
                w2=math.sqrt(w**2+(1.96*math.sqrt(2)*tau)**2)
                half=w2+b if comb=='linear' else math.hypot(w2,b)
                tot+=1; none+= abs(math.log(r['speedup']))<=half
    print(delta,comb,f"{none}/{tot}")
